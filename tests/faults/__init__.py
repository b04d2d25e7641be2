"""The fault suite: real workers, real servers, real crashes, and a checker for what conveyor promises."""
