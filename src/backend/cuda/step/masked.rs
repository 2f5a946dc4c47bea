//! The greedy step under grammar masks on the device: the layers run (or replay) as in any
//! step; while the GPU computes, the engine fills the packed allow-bits of the constrained rows
//! into page-locked memory (`masks::MaskRows`); one copy uploads them and
//! `argmax_masked_rows_f32` (kernels/argmax.cu) picks each row's token. What crosses PCIe is
//! `rows + masks x ceil(vocab / 32)` words up and `rows` ids down, instead of the `[rows, vocab]`
//! f32 logits (32 rows x 49,152 = 6.3 MB a step for the sample model; 1,536 words a mask).

use std::time::Duration;

use cudarc::driver::sys::CUevent_flags;

use super::flat::Flat;
use crate::backend::cuda::device::zeros;
use crate::backend::cuda::model::CudaBackend;
use crate::backend::cuda::ops::argmax::MaskedArgmaxRows;
use crate::backend::cuda::ops::launch::Dev;
use crate::backend::cuda::CudaError;
use crate::backend::masks::{FillMasks, MaskRows, MaskedGreedy};
use crate::backend::BackendError;

impl CudaBackend {
    /// Grows the mask buffers to `len` words.
    fn ensure_masks(&mut self, len: usize) -> Result<(), CudaError> {
        if len > self.work.masks.cap {
            let b = &mut self.work.masks;
            b.dev = None;
            b.dev = Some(zeros(&self.dev.stream, len, "mask bits")?);
            // SAFETY: the host buffer is written only between steps (every step ends with a
            // stream synchronize, so no upload from it is still running) and read by the copy.
            let pinned = unsafe { self.dev.ctx.alloc_pinned_with_flags::<u32>(len, 0) };
            b.host = Some(pinned.map_err(CudaError::driver("allocating pinned mask bits"))?);
            b.cap = len;
            self.note_memory();
        }
        if self.work.masks.events.is_none() {
            let ev = || {
                self.dev
                    .ctx
                    .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(CudaError::driver("creating a timing event"))
            };
            self.work.masks.events = Some((ev()?, ev()?));
        }
        Ok(())
    }

    /// Runs the step; `fill` writes the masks while the GPU computes; then the masks go up in
    /// one copy and each row's token is chosen on the device.
    pub(in crate::backend::cuda) fn forward_greedy_masked(
        &mut self,
        f: &Flat,
        fill: &mut FillMasks<'_>,
    ) -> Result<MaskedGreedy, BackendError> {
        let words = self.cfg.vocab_size.div_ceil(32);
        let m = f.m;
        self.ensure_masks(m + m * words)?;
        let mut w = std::mem::take(&mut self.work);
        let r = (|| -> Result<MaskedGreedy, BackendError> {
            self.run_step(&mut w, f)?;
            if m == 0 {
                return Ok(MaskedGreedy::default());
            }
            let s = self.dev.stream.clone();
            let b = &mut w.masks;
            let (after_layers, before_upload) = b.events.as_ref().expect("events made by ensure_masks");
            after_layers.record(&s).map_err(CudaError::driver("recording the step's end"))?;
            let host = b.host.as_mut().expect("pinned mask bits allocated by ensure_masks");
            let host = host.as_mut_slice().map_err(CudaError::driver("mapping the pinned mask bits"))?;
            let (mask_of, bits) = host[..m + m * words].split_at_mut(m);
            let mut rows = MaskRows::new(words, mask_of, bits);
            fill(&mut rows)?;
            let used = rows.used();
            before_upload.record(&s).map_err(CudaError::driver("recording the mask upload"))?;
            let len = m + used * words;
            let dev = b.dev.as_mut().expect("device mask bits allocated by ensure_masks");
            // The source is page-locked: the copy is asynchronous; the buffer is not written
            // again before the synchronize below.
            s.memcpy_htod(&host[..len], &mut dev.slice_mut(0..len))
                .map_err(CudaError::driver("uploading mask bits"))?;
            let all = Dev::of(dev, &s);
            let ids = w.argmax.as_ref().expect("arg-max buffer allocated by ensure_work");
            let logits = w.logits.as_ref().expect("logits allocated by ensure_work");
            MaskedArgmaxRows {
                x: Dev::of(logits, &s),
                mask_of: all,
                bits: all.offset(m),
                out: Dev::of(ids, &s),
                rows: m,
                n: self.cfg.vocab_size,
                words,
            }
            .launch(used, &mut self.kernels, &s)?;
            let got = s.clone_dtoh(&ids.slice(0..m)).map_err(CudaError::driver("downloading masked arg-max ids"))?;
            s.synchronize().map_err(CudaError::driver("waiting for the masked arg-max ids"))?;
            // GPU time between the end of the layers and the moment the masks were queued: how
            // long the device idled waiting for them (zero when they were ready first).
            let waited = after_layers.elapsed_ms(before_upload).map_err(CudaError::driver("reading the mask wait"))?;
            let mask_wait = Duration::from_secs_f64(f64::from(waited.max(0.0)) / 1e3);
            Ok(MaskedGreedy { ids: got.into_iter().map(|i| i as u32).collect(), mask_wait })
        })();
        self.work = w;
        r
    }
}
