"""conveyor's middleware, shared by every broker."""
