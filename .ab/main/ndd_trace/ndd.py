"""DALI's dynamic mode with `compile`, for code that is type-checked:

    from ndd_trace import ndd          # instead of: import nvidia.dali.experimental.dynamic as ndd

    @ndd.compile                       # mypy and pyright know it (ndd.pyi): CompiledFunction[P, R]
    def augment(images, size: int = 224):
        return ndd.resize(images, size=[size, size])

At run time this module *is* `nvidia.dali.experimental.dynamic` (the same module object, with
`ndd.compile` set by `import ndd_trace`); its stub, ndd.pyi, is DALI's own stub of that module
(re-exported whole) plus `compile`. DALI's stub does not know `ndd.compile`, so under the usual
import a type checker reports it as unknown; docs/typing.md lists the spellings.
"""

from __future__ import annotations

import sys

from . import _dali

sys.modules[__name__] = _dali.dynamic_module()  # `import ndd_trace.ndd` binds DALI's module itself
