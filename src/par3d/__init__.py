"""par3d: data x pipeline x tensor parallel transformer training, and a planner for it."""

__version__ = "0.1.0"
