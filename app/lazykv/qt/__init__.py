"""Qt views and the engine worker; engine calls go through lazykv.core on the worker's thread."""
