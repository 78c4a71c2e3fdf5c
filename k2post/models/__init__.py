"""Model-side pieces: the tokenizer builder (`tokenizer.py`) and model flavors/initialisation."""
