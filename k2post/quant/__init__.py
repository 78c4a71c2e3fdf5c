"""Quantization: K2 Thinking's INT4 weight-only QAT (fake quant, straight-through gradient) and its export."""
