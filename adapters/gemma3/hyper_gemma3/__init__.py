"""hyper-train adapter for Gemma 3 (``Gemma3ForConditionalGeneration``)."""
