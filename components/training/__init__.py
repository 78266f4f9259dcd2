"""Generic staged training on Ray Train: one ``TorchTrainer`` run per method stage."""
