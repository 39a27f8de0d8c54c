"""Quality beside speed: how far a sparse configuration's next-token distributions are from the dense
model's on the same real text (docs/QUALITY.md)."""
