"""The run folder: its layout, resuming it (every way), its lock, atomic files, checkpoint
files, provenance, the manifest and notes.

Importing this package (and ``layout``, ``files``, ``resume``, ``lock``, ``sweep``,
``provenance``) loads no torch; ``weights`` and ``checkpoint_io`` import it.
"""
