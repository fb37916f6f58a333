"""Whole-model estimates: model descriptions (``spec``) and, composed from the emulated
operations, what each design buys a model on a system."""
