"""specops.engine: a thin reference engine built on the specops ops."""
