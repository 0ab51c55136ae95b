//! The in-memory batch index of one segment: one entry per batch, rebuilt from the file on open
//! and never written to disk, so there is nothing to fsync or to get out of step with the log.

/// Where one batch lives in its segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchEntry {
    pub base_offset: i64,
    pub last_offset: i64,
    /// Byte position of the batch in the segment file.
    pub position: u64,
    pub len: u32,
    pub max_timestamp: i64,
    pub leader_epoch: i32,
}

impl BatchEntry {
    pub fn end_position(&self) -> u64 {
        self.position + self.len as u64
    }
}

/// Batches of one segment in offset order.
#[derive(Debug, Default, Clone)]
pub struct BatchIndex {
    entries: Vec<BatchEntry>,
}

impl BatchIndex {
    pub fn push(&mut self, e: BatchEntry) {
        debug_assert!(self
            .entries
            .last()
            .is_none_or(|l| l.last_offset < e.base_offset));
        self.entries.push(e);
    }
    pub fn entries(&self) -> &[BatchEntry] {
        &self.entries
    }
    pub fn last(&self) -> Option<&BatchEntry> {
        self.entries.last()
    }
    /// Index of the first batch whose last offset is at or after `offset`.
    pub fn find(&self, offset: i64) -> usize {
        self.entries.partition_point(|e| e.last_offset < offset)
    }
    /// Index of the first batch whose max timestamp is at or after `ts`.
    pub fn find_timestamp(&self, ts: i64) -> Option<usize> {
        self.entries.iter().position(|e| e.max_timestamp >= ts)
    }
    pub fn max_timestamp(&self) -> Option<&BatchEntry> {
        self.entries
            .iter()
            .max_by_key(|e| (e.max_timestamp, std::cmp::Reverse(e.base_offset)))
    }
}
