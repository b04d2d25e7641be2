"""What work exists: queues, payloads, job types, and the JobQueue to enqueue them."""
