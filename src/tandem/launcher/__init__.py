"""`tandem run`: from launcher flags to watched worker processes (own agent or torchrun's)."""
