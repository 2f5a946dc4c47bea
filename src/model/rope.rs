//! RoPE angle tables, shared by every backend (the CPU applies them per token, the CUDA
//! backend uploads them once). The frequencies come from `ModelConfig::rope_inv_freq` (or a
//! hybrid layer's partial rotation); how the dimensions pair is `RopeStyle`.

/// Cos/sin table of the rotation angles: `[n_pos, head_dim / 2]` each. Angles are computed in
/// f64 (position x frequency loses bits in f32 at long positions).
pub fn rope_table(positions: &[usize], inv_freq: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let mut cos = Vec::with_capacity(positions.len() * inv_freq.len());
    let mut sin = Vec::with_capacity(positions.len() * inv_freq.len());
    for &p in positions {
        for &f in inv_freq {
            let a = p as f64 * f as f64;
            cos.push(a.cos() as f32);
            sin.push(a.sin() as f32);
        }
    }
    (cos, sin)
}
