"""Held-out evaluation of a model on registered environments (`k2post eval`)."""
