//! The shape rules a model's hyper-parameters must keep, written once for every loader (GGUF
//! metadata, `config.json`): each rule blames a quantity ([`ShapeError`]) that the loader then
//! names as its own file does.

/// A quantity of the attention shape, as [`attention_shape`] blames it: each loader maps it to
/// its own file's name for the value (a GGUF key, a `config.json` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnField {
    /// Width of the residual stream.
    Dim,
    /// Query heads.
    Heads,
    /// Key/value heads.
    KvHeads,
    /// Size of one head.
    HeadDim,
}

/// A shape rule that a model's values break: the quantity to blame (`F`: [`AttnField`],
/// `moe::MoeField`, `hybrid::HybridField`) and why.
/// The reason leaves the quantity's own name to the caller, so it reads after it (mostly from
/// the value on): each loader names the quantity as its own file does, the rule is written once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeError<F> {
    pub field: F,
    pub reason: String,
}

impl<F: Copy> ShapeError<F> {
    /// `'name' reason`, the quantity named by `name` (how the GGUF loader reports it).
    pub fn named(&self, name: impl Fn(F) -> String) -> String {
        format!("'{}' {}", name(self.field), self.reason)
    }
}

/// An attention shape rule that a model's values break (see [`attention_shape`]).
pub type AttnShapeError = ShapeError<AttnField>;

/// The attention shape rules, written once for every loader (GGUF metadata, `config.json`):
/// whole query heads per KV head, and an even, positive head size (RoPE rotates pairs).
/// `head_dim` is the file's explicit head size; without one it is `dim / n_heads`, which must
/// then be exact. `name` spells a quantity as the caller's file does, for the reasons that name
/// a second one. Returns the head size.
pub fn attention_shape(
    dim: usize,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: Option<usize>,
    name: &dyn Fn(AttnField) -> String,
) -> Result<usize, AttnShapeError> {
    let fail = |field, reason| Err(AttnShapeError { field, reason });
    if n_heads == 0 {
        return fail(AttnField::Heads, "must be positive".into());
    }
    if n_kv_heads == 0 || !n_heads.is_multiple_of(n_kv_heads) {
        return fail(AttnField::KvHeads, format!("{n_kv_heads} must divide {} {n_heads}", name(AttnField::Heads)));
    }
    let even = |h: usize| h > 0 && h.is_multiple_of(2);
    match head_dim {
        // Sizes beyond any model's (256 today) would overflow the shapes computed from them.
        Some(h) if h > MAX_HEAD_DIM => fail(AttnField::HeadDim, format!("{h} must be at most {MAX_HEAD_DIM}")),
        Some(h) if even(h) => Ok(h),
        Some(h) => fail(AttnField::HeadDim, format!("{h} must be even and positive")),
        None => {
            let (d, h) = (name(AttnField::Dim), name(AttnField::Heads));
            if !dim.is_multiple_of(n_heads) {
                return fail(
                    AttnField::HeadDim,
                    format!("is missing and {d} {dim} is not a multiple of {h} {n_heads}"),
                );
            }
            let derived = dim / n_heads;
            if !even(derived) {
                let why = format!("is missing and {d} {dim} / {h} {n_heads} = {derived} must be even and positive");
                return fail(AttnField::HeadDim, why);
            }
            Ok(derived)
        }
    }
}

/// Largest head size a model may declare.
pub const MAX_HEAD_DIM: usize = 4096;

/// Most layers a model may declare. The deepest released models have ~130; a larger count is a
/// corrupt value, refused before per-layer tables are sized from it.
pub const MAX_LAYERS: usize = 1024;

/// Most routed experts a layer may declare (released models have up to 512): a larger count is
/// refused before the experts' tensors are listed.
pub const MAX_EXPERTS: usize = 16_384;

/// The layer count rule: between 1 and [`MAX_LAYERS`]. `Err` is the reason, to follow the
/// quantity's name.
pub fn layer_count(n: usize) -> Result<(), String> {
    if n == 0 || n > MAX_LAYERS {
        return Err(format!("{n} must be between 1 and {MAX_LAYERS}"));
    }
    Ok(())
}

/// The rule of a scale the forward pass divides by or raises to a power (the RMSNorm epsilon,
/// the RoPE base and scaling factors): a finite number above 0. NaN or a negative epsilon
/// silently turns every activation into NaN; a RoPE base of 0 makes every angle NaN.
/// The test is on the value as the model keeps it (f32): 1e300 is refused as well.
pub fn positive_finite(x: f64) -> Result<(), String> {
    let kept = x as f32;
    if !(kept.is_finite() && kept > 0.0) {
        // As the file most likely stores it (f32), unless that is no number at all.
        let shown = if kept.is_finite() || x.is_nan() { kept.to_string() } else { format!("{x:e}") };
        return Err(format!("{shown} must be a finite number above 0"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf_name(f: AttnField) -> String {
        format!("{f:?}").to_lowercase()
    }

    #[test]
    fn attention_shape_blames_the_quantity_that_breaks_a_rule() {
        let check = |dim, heads, kv, hd| attention_shape(dim, heads, kv, hd, &hf_name);
        assert_eq!(check(64, 4, 2, None), Ok(16));
        assert_eq!(check(64, 4, 2, Some(32)), Ok(32), "an explicit head size need not be dim / heads");
        let e = check(64, 4, 3, None).unwrap_err();
        assert_eq!(e.field, AttnField::KvHeads);
        assert_eq!(e.reason, "3 must divide heads 4");
        assert_eq!(check(64, 4, 0, None).unwrap_err().field, AttnField::KvHeads);
        assert_eq!(check(64, 0, 0, None).unwrap_err().field, AttnField::Heads);
        let e = check(64, 4, 2, Some(15)).unwrap_err();
        assert_eq!((e.field, e.reason.as_str()), (AttnField::HeadDim, "15 must be even and positive"));
        assert_eq!(check(64, 4, 2, Some(0)).unwrap_err().field, AttnField::HeadDim);
        let e = check(66, 4, 2, None).unwrap_err();
        assert_eq!(
            (e.field, e.reason.as_str()),
            (AttnField::HeadDim, "is missing and dim 66 is not a multiple of heads 4")
        );
        let e = check(60, 4, 2, None).unwrap_err();
        assert!(e.field == AttnField::HeadDim && e.reason.contains("= 15 must be even"), "{e:?}");
    }
}
