"""Scheduled retraining: an increment merged into the base data, a challenger, and the gate."""
