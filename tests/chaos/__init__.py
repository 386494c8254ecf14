"""The chaos soak (see soak.py): every fault at once, and a referee that counts broken promises."""
