//! GPU timestamps of a submit's compute pass, for the profiler (`runtime::profile`): taken
//! only while a profile is recording and only on devices opened with
//! `wgpu::Features::TIMESTAMP_QUERY` (requested where the adapter has it).

use super::Context;
use crate::runtime::profile;

/// A query set of two timestamps (the pass's start and end) and the buffers that bring
/// them back.
pub(crate) struct Stamps {
    set: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    read: wgpu::Buffer,
}

impl Stamps {
    /// Timestamps for the next pass, when a profile is recording and the device has them.
    pub fn new(ctx: &Context) -> Option<Stamps> {
        if !profile::on()
            || !ctx
                .device
                .features()
                .contains(wgpu::Features::TIMESTAMP_QUERY)
        {
            return None;
        }
        let buffer = |usage| {
            ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("ferrokeras timestamps"),
                size: 16,
                usage,
                mapped_at_creation: false,
            })
        };
        Some(Stamps {
            set: ctx.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("ferrokeras pass timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2,
            }),
            resolved: buffer(wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC),
            read: buffer(wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST),
        })
    }

    /// What the compute pass writes: its start and end.
    pub fn writes(&self) -> wgpu::ComputePassTimestampWrites<'_> {
        wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(0),
            end_of_pass_write_index: Some(1),
        }
    }

    /// Copies the timestamps out, after the pass (before the submit).
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        enc.resolve_query_set(&self.set, 0..2, &self.resolved, 0);
        enc.copy_buffer_to_buffer(&self.resolved, 0, &self.read, 0, 16);
    }

    /// Once the submit has completed: the pass's GPU time, noted for the submit's span
    /// (`profile::gpu_submit`). Nothing when the read fails: the span goes without it.
    pub fn finish(self, ctx: &Context) {
        let slice = self.read.slice(..);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        if ctx
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .is_err()
        {
            return;
        }
        if !matches!(rx.recv(), Ok(Ok(()))) {
            return;
        }
        let ticks = {
            let Ok(view) = slice.get_mapped_range() else {
                return;
            };
            let t: &[u64] = bytemuck::cast_slice(&view);
            t[1].saturating_sub(t[0])
        };
        self.read.unmap();
        let period = f64::from(ctx.queue.get_timestamp_period());
        profile::note_gpu_time((ticks as f64 * period) as u64);
    }
}
