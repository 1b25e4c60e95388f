//! [`MappedFile`]: a file mapped read-only into the address space, and [`MappedRange`],
//! a range of it that a host tensor can own ([`Tensor::from_owner`](crate::Tensor::from_owner)),
//! so that loading a checkpoint reads the page cache in place, with no copy into a heap
//! buffer first.
//!
//! Why a mapping and not `pread` into the staging slots: on the GPU machine (a 3.55 GB
//! file in the page cache, benches/results/issue22_weights/probe_run_A.json), 16 threads
//! reading with `pread` into page-locked memory reach 41 GB/s with nothing else running,
//! while the staging ring copying from a mapping moves the same file to the device at
//! 40 to 42 GB/s end to end: reading into the slots would not be faster, and a mapping
//! lets the ring's existing parallel copy do the reading. Page-locking the mapping
//! itself (read-only `cuMemHostRegister`) and copying straight from it was measured too:
//! the registration runs at 40 to 45 GB/s whatever the number of threads (the driver
//! serialises it) and, overlapped with the copies, the whole took 22 to 26 GB/s.

use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// A whole file mapped read-only (`MAP_SHARED`, `PROT_READ`): its bytes are the page
/// cache's, read on first touch (and read ahead from disk when asked, [`MappedFile::will_need`]).
///
/// Unmapped when dropped, on the dropping thread. Unmapping a 4 GiB checkpoint whose pages
/// a load touched took 4 to 6 ms on the GPU machine; handing it to a background thread
/// was tried and measured worse for the next load (its page faults and the unmapping's
/// TLB shootdowns run together: a back-to-back load took 110 to 117 ms instead of 87 to
/// 89; benches/results/issue22_weights/run_C).
pub(crate) struct MappedFile {
    map: memmap2::Mmap,
    /// The file, kept open: [`MappedFile::changed`] asks it again.
    file: File,
    /// What the file was when mapped.
    stamp: Stamp,
}

/// What identifies a file's contents cheaply: its length and its modification and change
/// times (a write in place moves them; a file replaced by a rename leaves the mapped one,
/// and so its bytes, as they were).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Stamp {
    len: u64,
    modified: Option<std::time::SystemTime>,
    /// The inode's change time (seconds, nanoseconds), where the platform has one.
    changed: (i64, i64),
}

impl Stamp {
    fn of(file: &File) -> std::io::Result<Stamp> {
        let m = file.metadata()?;
        #[cfg(unix)]
        let changed = {
            use std::os::unix::fs::MetadataExt;
            (m.ctime(), m.ctime_nsec())
        };
        #[cfg(not(unix))]
        let changed = (0, 0);
        Ok(Stamp {
            len: m.len(),
            modified: m.modified().ok(),
            changed,
        })
    }
}

/// Opens `path` for reading if it is a regular file (links followed); an
/// `InvalidInput` error otherwise, before any open that could block (a FIFO's).
pub(crate) fn open_regular(path: &Path) -> std::io::Result<File> {
    let not_regular = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a directory, FIFO, socket or device)",
        )
    };
    if !std::fs::metadata(path)?.is_file() {
        return Err(not_regular());
    }
    let file = File::open(path)?;
    // Again on what was opened: the path may have been replaced in between.
    if !file.metadata()?.is_file() {
        return Err(not_regular());
    }
    Ok(file)
}

impl MappedFile {
    /// Maps `path`. An empty file maps to no bytes.
    ///
    /// The mapping is only read. Its bytes are those of the file while it is mapped: a
    /// file changed meanwhile gives changed bytes, and one truncated meanwhile makes a
    /// read past its new end fault (`SIGBUS`), as for every loader that maps files (the
    /// `safetensors` crate, torch's `mmap=True`); the public docs say so.
    ///
    /// Only a regular file is opened: a FIFO named in its place would block the open for
    /// ever, and a device file (`/dev/zero`, through a link in a cloned model repository)
    /// has no end to map.
    pub(crate) fn open(path: &Path) -> std::io::Result<Arc<MappedFile>> {
        let file = open_regular(path)?;
        let stamp = Stamp::of(&file)?;
        // SAFETY: memmap2's contract is that nothing modifies the file while it is mapped.
        // pinlane never writes it (the mapping is read-only) and only copies bytes out of
        // it; a change by another process is the documented limit above (changed bytes,
        // or SIGBUS after truncation), as for any mapped-file loader, not undefined
        // behaviour pinlane introduces on its own. (An empty file maps to no bytes.)
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        Ok(Arc::new(MappedFile { map, file, stamp }))
    }

    /// Whether the file was written (or its length changed) since it was mapped, as far
    /// as its length and times tell (one `fstat`); `true` when they cannot be read. The
    /// bytes a changed file's mapping shows are no longer those its header was checked
    /// against.
    pub(crate) fn changed(&self) -> bool {
        Stamp::of(&self.file).map_or(true, |now| now != self.stamp)
    }

    /// The file's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// Asks the kernel to read the whole file ahead (`MADV_WILLNEED`), for a file not yet
    /// in the page cache; a hint, so its failure is ignored.
    pub(crate) fn will_need(&self) {
        #[cfg(unix)]
        if !self.map.is_empty() {
            let _ = self.map.advise(memmap2::Advice::WillNeed);
        }
    }

    /// `len` bytes at `at`, as an owner for a host tensor (keeping the mapping alive).
    /// `None` when the range is not inside the file.
    pub(crate) fn range(self: &Arc<Self>, at: usize, len: usize) -> Option<MappedRange> {
        let end = at.checked_add(len)?;
        (end <= self.bytes().len()).then(|| MappedRange {
            file: self.clone(),
            at,
            len,
        })
    }
}

/// A range of a [`MappedFile`], which it keeps mapped: the owner of a host tensor's bytes.
pub(crate) struct MappedRange {
    file: Arc<MappedFile>,
    at: usize,
    len: usize,
}

impl MappedRange {
    /// Whether the range starts at a multiple of `align` bytes in memory (a typed view of
    /// it needs its element's alignment).
    pub(crate) fn is_aligned(&self, align: usize) -> bool {
        (self.as_ref().as_ptr() as usize).is_multiple_of(align)
    }
}

impl AsRef<[u8]> for MappedRange {
    fn as_ref(&self) -> &[u8] {
        // In range: checked when the range was made, and the mapping never changes size.
        &self.file.bytes()[self.at..self.at + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_the_file_and_stay_inside_it() {
        let dir = std::env::temp_dir().join(format!("pinlane-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f.bin");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        let m = MappedFile::open(&p).unwrap();
        assert_eq!(m.bytes(), &bytes[..]);
        let r = m.range(100, 900).unwrap();
        assert_eq!(r.as_ref(), &bytes[100..1000]);
        assert!(m.range(9_000, 1_001).is_none());
        // The mapping starts on a page: offsets decide alignment.
        assert!(m.range(64, 8).unwrap().is_aligned(8));
        assert!(!m.range(66, 8).unwrap().is_aligned(4));
        assert!(m.range(usize::MAX, 2).is_none());
        assert_eq!(m.range(10_000, 0).unwrap().as_ref(), &[] as &[u8]);
        assert!(!m.changed());
        std::fs::write(&p, b"").unwrap();
        assert!(m.changed(), "written in place since it was mapped");
        assert!(MappedFile::open(&p).unwrap().bytes().is_empty());
        assert!(MappedFile::open(&dir.join("missing")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
