"""What the commands show: rich tables and text, pictures (matplotlib), and the one way
text from outside (workers, stores, files) reaches a terminal (safe_text)."""
