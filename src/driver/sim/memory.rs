//! Simulated memory: regions (device memory is host memory) and the quarantine of freed ones.

use super::*;

/// A region of simulated memory: page-aligned, zeroed at birth, freed on drop.
pub(super) struct Region {
    pub(super) ptr: HostPtr<u8>,
    pub(super) len: usize,
    pub(super) device: Option<usize>,
}

impl Region {
    pub(super) fn new(len: usize, device: Option<usize>, fill: u8) -> Option<Region> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` is a fresh allocation of at least `len` bytes.
        unsafe { std::ptr::write_bytes(ptr, fill, len.max(1)) };
        Some(Region {
            ptr: HostPtr(ptr),
            len,
            device,
        })
    }

    pub(super) fn addr(&self) -> u64 {
        self.ptr.0 as u64
    }

    pub(super) fn poison(&self, byte: u8) {
        // SAFETY: the region owns `len` bytes at `ptr`; callers hold the memory lock, so no
        // simulated copy touches them concurrently.
        unsafe { std::ptr::write_bytes(self.ptr.0, byte, self.len) };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Ok(layout) = std::alloc::Layout::from_size_align(self.len.max(1), 4096) {
            // SAFETY: allocated in `new` with this same layout; dropped once.
            unsafe { std::alloc::dealloc(self.ptr.0, layout) };
        }
    }
}

/// Bytes of freed memory kept (poisoned) before it is really released.
pub(super) const QUARANTINE: usize = 256 << 20;

#[derive(Default)]
pub(super) struct Memory {
    /// Live device allocations and page-locked host allocations, by start address.
    pub(super) live: BTreeMap<u64, Region>,
    /// Freed, poisoned regions still kept, by start address, and their order.
    pub(super) dead: BTreeMap<u64, Region>,
    pub(super) dead_order: VecDeque<u64>,
    pub(super) dead_bytes: usize,
    /// Device bytes in use, per device.
    pub(super) used: Vec<usize>,
    /// Highest `used` so far, per device.
    pub(super) high: Vec<usize>,
    /// Host ranges registered with `cuMemHostRegister`: start address -> (length, whether
    /// registered with `CU_MEMHOSTREGISTER_DEVICEMAP`).
    pub(super) registered: BTreeMap<u64, (usize, bool)>,
}

impl Memory {
    /// Whether `[addr, addr + n)` lies inside one live or quarantined region.
    pub(super) fn covers(&self, addr: u64, n: usize) -> bool {
        n == 0 || self.region_of(addr, n).is_some()
    }

    /// The live or quarantined region holding all of `[addr, addr + n)`.
    fn region_of(&self, addr: u64, n: usize) -> Option<&Region> {
        fn inside(map: &BTreeMap<u64, Region>, addr: u64, n: usize) -> Option<&Region> {
            map.range(..=addr)
                .next_back()
                .filter(|(&start, r)| addr - start + n as u64 <= r.len as u64)
                .map(|(_, r)| r)
        }
        inside(&self.live, addr, n).or_else(|| inside(&self.dead, addr, n))
    }

    /// Whether `[addr, addr + n)` is device memory (live or quarantined).
    pub(super) fn is_device(&self, addr: u64, n: usize) -> bool {
        n == 0 || self.region_of(addr, n).is_some_and(|r| r.device.is_some())
    }

    /// Whether a kernel may read `[addr, addr + n)`: device memory; or, on a device that
    /// maps host memory (`host_mapped`), page-locked host memory from `cuMemHostAlloc` or
    /// registered with `CU_MEMHOSTREGISTER_DEVICEMAP`.
    pub(super) fn kernel_readable(&self, addr: u64, n: usize, host_mapped: bool) -> bool {
        if n == 0 || self.is_device(addr, n) {
            return true;
        }
        let registered = self
            .registered
            .range(..=addr)
            .next_back()
            .is_some_and(|(&s, &(len, mapped))| mapped && addr - s + n as u64 <= len as u64);
        host_mapped && (self.covers(addr, n) || registered)
    }

    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` of the byte at `addr`: `CU_MEMORYTYPE_HOST` (1)
    /// for a registration or a live page-locked allocation, `CU_MEMORYTYPE_DEVICE` (2)
    /// for a live device allocation, none for memory the driver does not know: the buffer
    /// [`Memory::buffer_id`] finds there.
    pub(super) fn memory_type(&self, addr: u64) -> Option<u32> {
        let id = self.buffer_id(addr)?;
        if id & 1 << 63 != 0 {
            return Some(1); // a registration
        }
        // Any other id is a live allocation's start address.
        Some(if self.live.get(&id)?.device.is_some() {
            2
        } else {
            1
        })
    }

    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID` of the byte at `addr`: one id per registration and
    /// per live allocation (its start address, registrations marked by the top bit), none
    /// for memory the driver does not know.
    pub(super) fn buffer_id(&self, addr: u64) -> Option<u64> {
        let registered = self
            .registered
            .range(..=addr)
            .next_back()
            .filter(|(&s, &(len, _))| addr - s < len as u64)
            .map(|(&s, _)| s | 1 << 63);
        registered.or_else(|| {
            self.live
                .range(..=addr)
                .next_back()
                .filter(|(&s, r)| addr - s < r.len.max(1) as u64)
                .map(|(&s, _)| s)
        })
    }

    pub(super) fn bury(&mut self, r: Region) {
        r.poison(POISON_FREED);
        self.dead_bytes += r.len;
        self.dead_order.push_back(r.addr());
        self.dead.insert(r.addr(), r);
        while self.dead_bytes > QUARANTINE {
            let Some(a) = self.dead_order.pop_front() else {
                break;
            };
            if let Some(old) = self.dead.remove(&a) {
                self.dead_bytes -= old.len;
            }
        }
    }
}
