//! The cuBLAS F16 GEMM of prefill-sized products (no kernel file of ours): same conventions as
//! the kernel launchers (a struct of arguments, shape checks against the buffers).

use cudarc::cublas::sys as cublas_sys;
use cudarc::cublas::CudaBlas;

use super::super::CudaError;
use super::launch::{check, check_product_out, i32_of, need, Dev};

/// `out[t, r] (+)= sum_c w[r, c] x[t, c]` through cuBLAS: `w` F16 `[rows, cols]`, `x` F16
/// `[n_tok, cols]` (contiguous), `out` f32 `[n_tok, out_stride]`; f32 accumulation.
pub struct Gemm {
    pub w: Dev<u16>,
    pub x: Dev<u16>,
    pub out: Dev<f32>,
    pub rows: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub out_stride: usize,
    pub accumulate: bool,
}

impl Gemm {
    pub fn launch(&self, blas: &CudaBlas) -> Result<(), CudaError> {
        const K: &str = "cublas_gemm_f16";
        need(K, "weights", self.w, self.rows * self.cols)?;
        need(K, "input", self.x, self.n_tok * self.cols)?;
        check_product_out(K, (self.out, self.out_stride), None, self.rows, self.n_tok)?;
        check(K, self.rows <= self.out_stride, || "rows overlap their stride".into())?;
        if self.n_tok == 0 || self.rows == 0 {
            return Ok(());
        }
        let (alpha, beta) = (1.0f32, if self.accumulate { 1.0f32 } else { 0.0 });
        // Column-major view: out^T [rows, n_tok] = (w^T)^T [rows, cols] x x^T [cols, n_tok].
        // SAFETY: the three pointers were checked to cover the extents cuBLAS touches (lda = ldb
        // = cols, ldc = out_stride); alpha/beta live on the host for the call's duration.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                i32_of(K, self.rows)?,
                i32_of(K, self.n_tok)?,
                i32_of(K, self.cols)?,
                &alpha as *const f32 as *const _,
                self.w.ptr as *const _,
                cublas_sys::cudaDataType_t::CUDA_R_16F,
                i32_of(K, self.cols)?,
                self.x.ptr as *const _,
                cublas_sys::cudaDataType_t::CUDA_R_16F,
                i32_of(K, self.cols)?,
                &beta as *const f32 as *const _,
                self.out.ptr as *mut _,
                cublas_sys::cudaDataType_t::CUDA_R_32F,
                i32_of(K, self.out_stride)?,
                cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|source| CudaError::Cublas {
            what: format!("GEMM [{}x{}] x [{}x{}]", self.rows, self.cols, self.cols, self.n_tok),
            source,
        })
    }
}
