"""Hooks into SGLang that no registry covers yet: one target per file, each with why / how /
remove-when in its header. Installed only while a LUMOTREE server runs."""
