"""meshlayout: named device meshes, process groups and exact sharding for N-D parallelism.

Layers (a lower layer never imports a higher one):

1. :mod:`meshlayout.layout` — CuTe-style layout algebra, row-major.
2. :mod:`meshlayout.mesh`, :mod:`meshlayout.sharding` — meshes over a shared rank map;
   placements and exact local pieces.
3. :mod:`meshlayout.parallel_dims`, :mod:`meshlayout.render` — named views; pictures.
4. :mod:`meshlayout.cli`, :mod:`meshlayout.torch` — command line; torch.distributed runtime.

``import meshlayout`` never imports torch.
"""

from .layout import Layout, logical_divide, logical_product, make_layout
from .megatron import MegatronDims
from .mesh import Mesh
from .parallel_dims import ParallelDims
from .rank_map import RankMap
from .sharding import Partial, Replicate, Shard, ShardingSpec, StridedShard

__all__ = [
    "Layout",
    "MegatronDims",
    "Mesh",
    "ParallelDims",
    "Partial",
    "RankMap",
    "Replicate",
    "Shard",
    "ShardingSpec",
    "StridedShard",
    "logical_divide",
    "logical_product",
    "make_layout",
]
__version__ = "0.1.0"
