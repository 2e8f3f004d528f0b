"""One speculative round's steps, with no clock and no I/O: drafting a block, verifying it, the
random draws every mode shares, and the stop rule."""
