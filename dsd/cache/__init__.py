"""The speculation cache of cached pipelined DSD: next blocks drafted for a verdict's likely
outcomes, filled while a block is verified."""
