"""One module per job: what the job does."""
