"""What the machine running the tests computes with, for the tests whose exact figures depend on it."""
from pathlib import Path
import veloxquant_mlx  # noqa: F401  (loads OpenBLAS before mlx on Linux)
from veloxquant_mlx.blas import blas_status, wheel_openblas

def system_openblas()->bool:
    "True when an OpenBLAS other than the cmeel-openblas wheel's serves MLX here (a system one, e.g. Debian's)."
    st, wheel = blas_status(), wheel_openblas()
    return st.loaded and st.path is not None and (wheel is None or Path(st.path).resolve() != wheel.resolve())
