"""How many store records warming writes per chunk with the default config: the KV behind
neighbours and, with ``lead_alone``, the KV warmed alone for a prompt's first chunk."""

from cacheblend import BlendConfig

_DEFAULT = BlendConfig()
RECORDS_PER_CHUNK = 2 if _DEFAULT.neighbours and _DEFAULT.lead_alone else 1
