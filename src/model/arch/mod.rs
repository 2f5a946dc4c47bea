//! The model families dustoff runs: the registry (GGUF `general.architecture` / HF class ->
//! family) and one file per family describing it (see [`Family`]). Adding a family whose layer
//! kinds exist: one file here, its variant and line below, and its reference test.

mod family;
mod llama;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen35;
mod qwen35moe;
mod qwen3moe;
mod qwen3next;

pub use family::{
    AttentionSpec, Family, FfnSpec, HeadGrouping, MixerSpec, MoeSpec, NormTopk, PreTokenizer, RopeStyle, TinyHf,
};

/// A model family, by name. Its description is [`Arch::family`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen2Moe,
    Qwen3,
    Qwen3Moe,
    Qwen35,
    Qwen35Moe,
    Qwen3Next,
}

/// Every family, in the order error messages list them.
pub const ALL: &[Arch] = &[
    Arch::Llama,
    Arch::Qwen2,
    Arch::Qwen2Moe,
    Arch::Qwen3,
    Arch::Qwen3Moe,
    Arch::Qwen35,
    Arch::Qwen35Moe,
    Arch::Qwen3Next,
];

impl Arch {
    /// The family's description (the registry: one line per family).
    pub fn family(self) -> &'static Family {
        match self {
            Arch::Llama => &llama::FAMILY,
            Arch::Qwen2 => &qwen2::FAMILY,
            Arch::Qwen2Moe => &qwen2moe::FAMILY,
            Arch::Qwen3 => &qwen3::FAMILY,
            Arch::Qwen3Moe => &qwen3moe::FAMILY,
            Arch::Qwen35 => &qwen35::FAMILY,
            Arch::Qwen35Moe => &qwen35moe::FAMILY,
            Arch::Qwen3Next => &qwen3next::FAMILY,
        }
    }
    pub fn name(self) -> &'static str {
        self.family().gguf_name
    }
    /// Gated DeltaNet layers between full-attention ones (see `model::hybrid`).
    pub fn is_hybrid(self) -> bool {
        self.family().is_hybrid()
    }
    /// Mixture-of-experts FFNs (see `model::moe`).
    pub fn is_moe(self) -> bool {
        self.family().moe().is_some()
    }
    /// How a GGUF file of this family pairs RoPE dimensions: llama.cpp's converter permutes
    /// llama Q/K rows to adjacent pairs and leaves the others in halves (a Hugging Face
    /// directory is always `Halves`).
    pub fn gguf_rope_style(self) -> RopeStyle {
        self.family().gguf_rope_style
    }
    /// Per-head RMSNorm on Q and K before RoPE (`attn_q_norm`, `attn_k_norm`).
    pub fn has_qk_norm(self) -> bool {
        self.family().attention.qk_norm
    }
    /// A gated shared expert beside the routed ones in every sparse layer.
    pub fn has_shared_expert(self) -> bool {
        self.family().moe().is_some_and(|m| m.shared)
    }
}

/// The family of a GGUF file's `general.architecture`.
pub fn by_gguf_name(name: &str) -> Option<Arch> {
    ALL.iter().copied().find(|a| a.family().gguf_name == name)
}

/// The family of an HF `architectures` class, and whether the class is a vision-language
/// wrapper whose `text_config` holds the text model.
pub fn by_hf_class(class: &str) -> Option<(Arch, bool)> {
    ALL.iter().find_map(|&a| {
        let f = a.family();
        if f.hf_classes.contains(&class) {
            Some((a, false))
        } else {
            f.hf_vl_classes.contains(&class).then_some((a, true))
        }
    })
}

/// The GGUF names of every family, for the message that refuses another.
pub fn gguf_names() -> String {
    ALL.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
}

/// The HF classes of every family (text-only, then the vision-language wrappers whose text
/// model is loaded), for the message that refuses another.
pub fn hf_class_names() -> String {
    let f = |vl: bool| ALL.iter().flat_map(move |a| if vl { a.family().hf_vl_classes } else { a.family().hf_classes });
    f(false).chain(f(true)).copied().collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_found_by_its_names() {
        for &a in ALL {
            let f = a.family();
            assert_eq!(f.arch, a);
            assert_eq!(by_gguf_name(f.gguf_name), Some(a));
            for c in f.hf_classes {
                assert_eq!(by_hf_class(c), Some((a, false)), "{c}");
            }
            for c in f.hf_vl_classes {
                assert_eq!(by_hf_class(c), Some((a, true)), "{c}");
            }
        }
        assert_eq!(by_gguf_name("gpt2"), None);
        assert_eq!(by_hf_class("GPT2LMHeadModel"), None);
        assert_eq!(gguf_names(), "llama, qwen2, qwen2moe, qwen3, qwen3moe, qwen35, qwen35moe, qwen3next");
    }
}
