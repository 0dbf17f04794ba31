"""``python -m taylorattr.taylor.mode > docs/supported_ops.md`` regenerates the support table."""
from . import supported_ops_markdown

print(supported_ops_markdown())
