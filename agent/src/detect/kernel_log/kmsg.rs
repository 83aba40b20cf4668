//! The kernel log read from `/dev/kmsg`: one record per read, from the oldest the kernel
//! still holds.

use std::{
    io::{Read, Seek, SeekFrom},
    os::unix::fs::OpenOptionsExt,
    path::PathBuf,
    time::Duration,
};

use super::{Reader, record_of};

/// Follows `/dev/kmsg` from the oldest record the kernel holds, in a thread of its own (reads
/// block), until the receiver of the Events is gone.
pub fn follow(device: PathBuf, reader: Reader) -> std::io::Result<()> {
    // Not blocking: a read with nothing left says so, which is when the reader caught up.
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(&device)?;
    // A new reader of /dev/kmsg starts at the oldest record still in the ring buffer.
    file.seek(SeekFrom::Start(0))?;
    std::thread::Builder::new().name("kmsg".into()).spawn(move || {
        // One read returns one record; records are at most about 8 KiB.
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            match file.read(&mut buffer) {
                Ok(0) => {
                    reader.caught_up();
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    reader.caught_up();
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(len) => {
                    let raw = String::from_utf8_lossy(&buffer[..len]);
                    if let Some(record) = record_of(&raw)
                        && !reader.take(record.sequence, record.since_boot, record.message)
                    {
                        return;
                    }
                }
                // EPIPE: the ring buffer overwrote records we had not read; go on from here.
                Err(e) if e.raw_os_error() == Some(nix::libc::EPIPE) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::warn!(error = %e, device = %device.display(), "reading the kernel log failed; stopping it");
                    return;
                }
            }
        }
    })?;
    Ok(())
}
