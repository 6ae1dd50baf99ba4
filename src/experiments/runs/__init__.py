"""The run folder: its layout, resuming it (every way), its lock, atomic files, checkpoint
files, provenance, and its saved config read back for eval/predict.

Importing this package (and ``layout``, ``resume``, ``lock``, ``saved``) loads no torch;
the checkpoint modules import it when used.
"""
