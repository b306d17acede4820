//! The FUSE side: every request is answered from the model under one lock, and every
//! durable step goes to the backing directory before the request is answered (so an
//! fsync that returned is in the backing directory, whatever the cut does later).

use std::ffi::OsStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation,
    INodeNo, LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::backing::BackingDir;
use crate::model::{self, Attr, Ino, Kind, Model};

/// The model and its mirror, shared by the FUSE thread and the [`crate::LazyFs`] handle.
pub struct Shared {
    pub model: Model,
    pub backing: BackingDir,
}

/// Nothing is cached by the kernel: names and attributes are asked for every time, and
/// files are opened with direct I/O, so no page the kernel kept can outlive a cut.
const TTL: Duration = Duration::ZERO;

pub struct Fs {
    pub shared: Arc<Mutex<Shared>>,
}

fn errno(e: model::Errno) -> Errno {
    Errno::from_i32(e.0)
}

fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.size.div_ceil(512),
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.ctime,
        kind: match a.kind {
            Kind::File => FileType::RegularFile,
            Kind::Dir => FileType::Directory,
        },
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn perm(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

fn time(t: TimeOrNow) -> SystemTime {
    match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    }
}

impl Fs {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        // A panic while holding the lock leaves a model that may be half-changed; the
        // filesystem keeps answering from it rather than failing every later request.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry(&self, sh: &Shared, ino: Ino, reply: ReplyEntry) {
        match sh.model.attr(ino) {
            Ok(a) => reply.entry(&TTL, &file_attr(&a), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }
}

impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let sh = self.lock();
        match sh.model.lookup(parent.0, name) {
            Ok(ino) => self.entry(&sh, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let sh = self.lock();
        if sh.model.is_cut() {
            return reply.error(Errno::EIO);
        }
        match sh.model.attr(ino.0) {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let mut guard = self.lock();
        let sh = &mut *guard;
        let ino = ino.0;
        let r = (|| {
            if let Some(len) = size {
                sh.model.set_len(ino, len)?;
            }
            if let Some(m) = mode {
                sh.model
                    .set_perm(&mut sh.backing, ino, (m & 0o7777) as u16)?;
            }
            if uid.is_some() || gid.is_some() {
                sh.model.set_owner(ino, uid, gid)?;
            }
            if atime.is_some() || mtime.is_some() {
                sh.model.set_times(ino, atime.map(time), mtime.map(time))?;
            }
            sh.model.attr(ino)
        })();
        match r {
            Ok(a) => reply.attr(&TTL, &file_attr(&a)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let mut sh = self.lock();
        match sh
            .model
            .create(parent.0, name, perm(mode, umask), req.uid(), req.gid())
        {
            Ok(ino) => self.entry(&sh, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mut guard = self.lock();
        let sh = &mut *guard;
        match sh.model.mkdir(
            &mut sh.backing,
            parent.0,
            name,
            perm(mode, umask),
            req.uid(),
            req.gid(),
        ) {
            Ok(ino) => self.entry(sh, ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.lock().model.unlink(parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let mut guard = self.lock();
        let sh = &mut *guard;
        match sh.model.rmdir(&mut sh.backing, parent.0, name) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if flags.intersects(RenameFlags::RENAME_EXCHANGE | RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let mut guard = self.lock();
        let sh = &mut *guard;
        match sh.model.rename(
            &mut sh.backing,
            parent.0,
            name,
            newparent.0,
            newname,
            noreplace,
        ) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut sh = self.lock();
        match sh.model.link(ino.0, newparent.0, newname) {
            Ok(()) => self.entry(&sh, ino.0, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let mut sh = self.lock();
        let r = (|| {
            let a = sh.model.attr(ino.0)?;
            if sh.model.is_cut() {
                return Err(model::Errno::IO);
            }
            if a.kind == Kind::File && flags.0 & libc::O_TRUNC != 0 {
                sh.model.set_len(ino.0, 0)?;
            }
            Ok(())
        })();
        match r {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let sh = self.lock();
        match sh.model.read(ino.0, offset, size as usize) {
            Ok(d) => reply.data(d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.lock().model.write(ino.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) makes nothing durable.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut guard = self.lock();
        let sh = &mut *guard;
        match sh.model.fsync(&mut sh.backing, ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let sh = self.lock();
        match sh.model.entries(ino.0) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let sh = self.lock();
        let (entries, parent) = match (sh.model.entries(ino.0), sh.model.parent(ino.0)) {
            (Ok(e), Ok(p)) => (e, p),
            (Err(e), _) | (_, Err(e)) => return reply.error(errno(e)),
        };
        let all = [
            (OsStr::new(".").to_owned(), ino.0, Kind::Dir),
            (OsStr::new("..").to_owned(), parent, Kind::Dir),
        ]
        .into_iter()
        .chain(entries);
        for (i, (name, e_ino, kind)) in all.enumerate().skip(offset as usize) {
            let kind = match kind {
                Kind::File => FileType::RegularFile,
                Kind::Dir => FileType::Directory,
            };
            if reply.add(INodeNo(e_ino), i as u64 + 1, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let mut guard = self.lock();
        let sh = &mut *guard;
        match sh.model.fsync_dir(&mut sh.backing, ino.0) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room: the model lives in memory.
        reply.statfs(1 << 24, 1 << 24, 1 << 24, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        let sh = self.lock();
        if sh.model.is_cut() {
            return reply.error(Errno::EIO);
        }
        // The kernel checks permissions itself (`default_permissions`).
        match sh.model.attr(ino.0) {
            Ok(_) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        if mode & libc::S_IFMT != 0 && mode & libc::S_IFMT != libc::S_IFREG {
            return reply.error(Errno::EPERM);
        }
        let mut sh = self.lock();
        let r = match sh.model.lookup(parent.0, name) {
            // The kernel looked first; another request created it meanwhile.
            Ok(_) if flags & libc::O_EXCL != 0 => Err(model::Errno::EXIST),
            Ok(ino) => {
                if flags & libc::O_TRUNC != 0 {
                    sh.model.set_len(ino, 0).map(|()| ino)
                } else {
                    Ok(ino)
                }
            }
            Err(_) => sh
                .model
                .create(parent.0, name, perm(mode, umask), req.uid(), req.gid()),
        };
        match r.and_then(|ino| sh.model.attr(ino)) {
            Ok(a) => reply.created(
                &TTL,
                &file_attr(&a),
                Generation(0),
                FileHandle(0),
                FopenFlags::FOPEN_DIRECT_IO,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mut sh = self.lock();
        let r = (|| {
            let size = sh.model.attr(ino.0)?.size;
            if sh.model.is_cut() {
                return Err(model::Errno::IO);
            }
            match mode {
                // Allocation only: the size grows like a truncate up.
                0 if offset + length > size => sh.model.set_len(ino.0, offset + length),
                0 | libc::FALLOC_FL_KEEP_SIZE => Ok(()),
                m if m == libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE => {
                    let end = (offset + length).min(size);
                    if end > offset {
                        let zeros = vec![0u8; (end - offset) as usize];
                        sh.model.write(ino.0, offset, &zeros)
                    } else {
                        Ok(())
                    }
                }
                _ => Err(model::Errno(libc::EOPNOTSUPP)),
            }
        })();
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(e)),
        }
    }
}
