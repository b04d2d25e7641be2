"""What tests share: private servers, harnesses, job modules for workers, waiting helpers."""
