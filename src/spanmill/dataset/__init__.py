"""Training data built from spans: episodes, samples, credit assignment, datasets."""
