"""The K API, one module per family; `ferrokeras.backend` re-exports them."""
