"""agentcell's version (``runtime.__version__``), in a module of its own so the runtime's modules can read it
without importing the package root (which imports them)."""

__version__ = "0.1.0"
