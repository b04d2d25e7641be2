"""conveyor's HTTP side: FastAPI routers composed in ``conveyor/api/app.py``."""
