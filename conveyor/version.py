"""conveyor's version, in a module that imports nothing.

The one place in the code it is written (pyproject.toml repeats it for packaging): ``conveyor.__version__`` re-exports it, and the
workers' fleet records and the API's OpenAPI document read it from here, so
neither has to import the package root (and with it the App).
"""

__version__ = "0.1.0"
