"""Training: train(cfg) and the Hydra task (pipeline), objects from config (build), the
remedies of a failed job, cross-validation and the model card."""
