"""The store (R-RES, R-DB, R-SC-1): reserve and settle, migrations, the write lock, both backends,
crashes and races."""
