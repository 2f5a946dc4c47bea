//! Launcher of `kernels/argmax.cu`'s row arg-max (greedy decoding on the device; the masked
//! variant of constrained decoding is launched from `masked`).

use cudarc::driver::{CudaStream, DeviceRepr};

use super::kernels::Kernels;
use super::launch::{i32_of, launch, need, Dev};
use super::CudaError;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ArgmaxParams {
    x: u64,
    out: u64,
    rows: i32,
    n: i32,
}
// SAFETY: plain-old-data with the C layout of the kernel's struct.
unsafe impl DeviceRepr for ArgmaxParams {}

/// `out[r] = argmax(x[r, ..n])` for each of `rows` rows (kernels/argmax.cu; the host twin is
/// `engine::sampler::argmax`).
pub struct ArgmaxRows {
    pub x: Dev<f32>,
    pub out: Dev<i32>,
    pub rows: usize,
    pub n: usize,
}

impl ArgmaxRows {
    pub fn launch(&self, k: &mut Kernels, s: &CudaStream) -> Result<(), CudaError> {
        const K: &str = "argmax_rows_f32";
        need(K, "logits", self.x, self.rows * self.n)?;
        need(K, "output", self.out, self.rows)?;
        if self.rows == 0 {
            return Ok(());
        }
        let rows = i32_of(K, self.rows)?;
        let p = ArgmaxParams { x: self.x.ptr, out: self.out.ptr, rows, n: i32_of(K, self.n)? };
        launch(k, s, K, (rows as u32, 1, 1), 1024, 0, &p)
    }
}
