"""NAS search spaces that build PyTorch models from an Optuna trial (see the Optuna plugin issue)."""
