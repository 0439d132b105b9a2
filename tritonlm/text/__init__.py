"""Text: tokenization, incremental detokenization, stop strings, pre- and postprocessing."""
