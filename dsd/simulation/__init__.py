"""The real protocol code on virtual time: one client against a verifier that serves it alone, and
many closed-loop clients sharing one verifier."""
