//! Gives memory the allocator keeps after a burst back to the system.
//!
//! mimalloc (the agent's allocator, `main.rs`) keeps a thread's freed pages for reuse and
//! returns them to the system only from that thread's own allocation calls (after a purge
//! delay of 1 s). A connection thread that goes idle after a burst makes no more calls, so
//! without help it would hold its peak for as long as it stays idle: measured, an ingress
//! agent kept 20.5 MiB (12.5 MiB anonymous) after a 5-second load at 128 connections,
//! against 8.6 MiB (1.2 MiB) before it. Each runtime thread therefore runs [`release_periodically`],
//! which collects its own heap every [`RELEASE_INTERVAL`]: the first collection after the
//! burst frees the empty pages, the next one (after the purge delay) returns them.
//!
//! Without the `mimalloc` feature (the system allocator) there is nothing to do.

use std::time::Duration;

/// How often each thread collects its heap. Two collections a purge delay apart return a
/// burst's memory (measured: 19.9 MiB at the end of a burst, 11.9 MiB 6 s later, 9.0 at the
/// start); under load, one collection per thread per interval did not show in the ingress
/// benchmark (docs/benchmarks.md#agent-pod-memory).
pub const RELEASE_INTERVAL: Duration = Duration::from_secs(2);

/// Collects the heap of the thread it runs on every [`RELEASE_INTERVAL`], forever. On a
/// current-thread runtime that is always the runtime's thread; on a multi-threaded one,
/// whichever worker polls it (the purge of freed pages is shared by all threads, the
/// freeing of a heap's empty pages is not).
pub async fn release_periodically() {
    let mut ticks = tokio::time::interval(RELEASE_INTERVAL);
    // A thread that was busy past a tick collects once, not once per missed tick.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        release_thread_memory();
    }
}

/// Frees the calling thread's empty pages and returns the ones freed at least a purge delay
/// ago to the system.
pub fn release_thread_memory() {
    #[cfg(feature = "mimalloc")]
    // SAFETY: `mi_collect` takes no pointers; it only walks the calling thread's heap and
    // the shared arenas under mimalloc's own synchronisation.
    unsafe {
        libmimalloc_sys::mi_collect(false);
    }
}

#[cfg(all(test, feature = "mimalloc"))]
mod tests {
    use std::alloc::{GlobalAlloc, Layout};
    use std::time::{Duration, Instant};

    use mimalloc::MiMalloc;

    use super::release_thread_memory;

    const PAGE: usize = 4096;

    /// How many of the whole pages inside the blocks at `starts` (each `size` bytes) are
    /// resident (mincore(2)): freed blocks stay resident until mimalloc purges them.
    fn resident_pages(starts: &[usize], size: usize) -> Result<usize, String> {
        let mut resident = 0;
        for &start in starts {
            let first = start.div_ceil(PAGE) * PAGE;
            let end = (start + size) / PAGE * PAGE;
            let pages = end.saturating_sub(first) / PAGE;
            let mut vector = vec![0u8; pages];
            // SAFETY: `first..end` lies in memory mimalloc mapped (it may be purged, never
            // unmapped while the arena lives); the vector has one byte per page.
            let result = unsafe {
                libc::mincore(first as *mut libc::c_void, end - first, vector.as_mut_ptr())
            };
            if result != 0 {
                return Err(format!("mincore: {}", std::io::Error::last_os_error()));
            }
            resident += vector.iter().filter(|&&page| page & 1 == 1).count();
        }
        Ok(resident)
    }

    #[test]
    fn a_burst_is_given_back_to_the_system_by_the_collections() -> Result<(), String> {
        const BLOCKS: usize = 1024;
        const SIZE: usize = 16 * 1024;
        let layout = Layout::from_size_align(SIZE, 8).map_err(|error| error.to_string())?;
        // On a thread of its own, like a connection thread: its heap holds the burst.
        std::thread::spawn(move || {
            let mut starts = Vec::with_capacity(BLOCKS);
            for index in 0..BLOCKS {
                // SAFETY: a non-zero size; every block is written within its size and
                // freed once with its layout below.
                unsafe {
                    let block = MiMalloc.alloc(layout);
                    if block.is_null() {
                        return Err("allocation failed".to_owned());
                    }
                    block.write_bytes(u8::try_from(index % 251).unwrap_or(1), SIZE);
                    starts.push(block as usize);
                }
            }
            let touched = resident_pages(&starts, SIZE)?;
            for &start in &starts {
                // SAFETY: allocated above with this layout, freed once.
                unsafe { MiMalloc.dealloc(start as *mut u8, layout) };
            }
            // Freed but kept: what an idle thread would hold without the collections.
            let kept = resident_pages(&starts, SIZE)?;
            if kept < touched / 2 {
                return Err(format!(
                    "mimalloc gave the burst back by itself ({kept} of {touched} pages kept): \
                     this test shows nothing"
                ));
            }
            // The first collection frees the pages, one after the purge delay returns them.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                release_thread_memory();
                let left = resident_pages(&starts, SIZE)?;
                if left < touched / 10 {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    return Err(format!(
                        "{left} of {touched} pages still resident 10 s after the burst"
                    ));
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
        .join()
        .map_err(|_| "the burst thread panicked".to_owned())?
    }
}
