"""The commands on a finished run: SavedRun (a run opened again from a closed vocabulary),
eval, predict, calibrate, export and verify."""
