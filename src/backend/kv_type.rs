//! The element type of the paged KV cache (`--kv-cache f16|q8`).
//!
//! `q8`: each head vector is cut into groups of [`Q8_GROUP`] values stored as int8 with one F16
//! scale per group (GGML's Q8_0 layout, 34 bytes per 32 values against 64 in F16: 1.88x the
//! positions in the same memory). A group is quantized when it is written:
//! `d = f16_sat(amax / 127)`, `q = clamp(rint(x / d), -127, 127)` (0 where `d` is 0), and read
//! back as `f16_sat(q * d)`, the F16 value every attention kernel then works with as it does with
//! an F16 cache. The CPU backend (the reference) keeps f32 caches and stores that read-back
//! value ([`q8_round_trip`]), so both backends attend over the same numbers.

use half::f16;

/// Values per scale of the 8-bit cache (a head vector holds a whole number of groups).
pub const Q8_GROUP: usize = 32;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    #[default]
    F16,
    Q8,
}

impl KvType {
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8 => "q8",
        }
    }

    /// Device bytes of `n` cached values (a whole number of groups for `Q8`).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 => 2 * n,
            KvType::Q8 => n + n / Q8_GROUP * 2,
        }
    }

    /// Why a model with heads of `head_dim` cannot use this type, if it cannot.
    pub fn refusal(self, head_dim: usize) -> Option<String> {
        (self == KvType::Q8 && !head_dim.is_multiple_of(Q8_GROUP)).then(|| {
            format!("--kv-cache q8 needs head sizes that are a multiple of {Q8_GROUP}; this model's are {head_dim}")
        })
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--kv-cache '{0}': use f16, q8 or auto")]
pub struct KvTypeError(pub String);

/// `--kv-cache`: a type, or `auto` (the memory plan chooses: F16 when the job's sequences fit,
/// else 8-bit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvChoice {
    #[default]
    Auto,
    Fixed(KvType),
}

impl KvChoice {
    /// The type where no memory plan chooses (the CPU, data-parallel engines): `auto` is F16.
    pub fn or_f16(self) -> KvType {
        match self {
            KvChoice::Fixed(t) => t,
            KvChoice::Auto => KvType::F16,
        }
    }
}

impl std::str::FromStr for KvChoice {
    type Err = KvTypeError;
    fn from_str(s: &str) -> Result<Self, KvTypeError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(KvChoice::Auto),
            "f16" => Ok(KvChoice::Fixed(KvType::F16)),
            "q8" | "q8_0" | "int8" => Ok(KvChoice::Fixed(KvType::Q8)),
            _ => Err(KvTypeError(s.to_string())),
        }
    }
}

/// What the 8-bit cache keeps of one group of [`Q8_GROUP`] values, written back in place (the
/// read-back value of every element; see the module notes). Same arithmetic as the GPU's store
/// and load (`kv_q8_*` in kernels/common.cuh): IEEE division and product, round to nearest even.
pub fn q8_round_trip(x: &mut [f32]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32((amax / 127.0).min(65504.0)).to_f32();
    for v in x.iter_mut() {
        let q = if d == 0.0 { 0.0 } else { (*v / d).round_ties_even().clamp(-127.0, 127.0) };
        *v = f16::from_f32((q * d).clamp(-65504.0, 65504.0)).to_f32();
    }
}

/// [`q8_round_trip`] of every group of a row of whole head vectors (`x.len()` a multiple of
/// [`Q8_GROUP`]); nothing for `F16` (the CPU caches keep f32 then).
pub fn store_row(kv: KvType, x: &mut [f32]) {
    if kv == KvType::Q8 {
        x.chunks_exact_mut(Q8_GROUP).for_each(q8_round_trip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_keeps_each_value_within_half_a_step_of_its_group() {
        let mut x: Vec<f32> = (0..32).map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.173).collect();
        let orig = x.clone();
        q8_round_trip(&mut x);
        let amax = orig.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16::from_f32(amax / 127.0).to_f32();
        for (a, b) in orig.iter().zip(&x) {
            // Half a step, plus the F16 rounding of the read-back value.
            assert!((a - b).abs() <= d / 2.0 + a.abs() / 1024.0, "{a} -> {b} (step {d})");
            assert_eq!(*b, f16::from_f32(*b).to_f32(), "read back as an F16 value");
        }
        // The largest magnitude maps to +-127 steps.
        let i = orig.iter().position(|v| v.abs() == amax).unwrap();
        assert_eq!(x[i], f16::from_f32(127.0 * d * orig[i].signum()).to_f32());
        let mut zeros = [0f32; 32];
        q8_round_trip(&mut zeros);
        assert!(zeros.iter().all(|&v| v == 0.0));
        // Beyond the F16 range: the scale saturates at 65504 / 127 and so do the values.
        let mut big = [1e9f32; 32];
        q8_round_trip(&mut big);
        assert!(big.iter().all(|v| v.is_finite() && *v <= 65504.0), "{big:?}");
    }

    #[test]
    fn bytes_and_names() {
        assert_eq!(KvType::F16.bytes(128), 256);
        assert_eq!(KvType::Q8.bytes(128), 136);
        assert_eq!("q8".parse::<KvChoice>().unwrap(), KvChoice::Fixed(KvType::Q8));
        assert_eq!("auto".parse::<KvChoice>().unwrap(), KvChoice::Auto);
        assert!("q4".parse::<KvChoice>().unwrap_err().to_string().contains("f16, q8 or auto"));
        assert!(KvType::Q8.refusal(80).unwrap().contains("80"));
        assert!(KvType::Q8.refusal(128).is_none() && KvType::F16.refusal(80).is_none());
    }
}
