//! A request's result as the kernel's answer, for both file systems: the
//! value on success (attributes never cached, see [`TTL`]), its errno on
//! failure.

use fuser::{Errno, FileAttr, ReplyAttr, ReplyData, ReplyEmpty};

use crate::kernel::TTL;

pub(crate) fn empty(done: Result<(), Errno>, reply: ReplyEmpty) {
    match done {
        Ok(()) => reply.ok(),
        Err(errno) => reply.error(errno),
    }
}

pub(crate) fn attr(attr: Result<FileAttr, Errno>, reply: ReplyAttr) {
    match attr {
        Ok(attr) => reply.attr(&TTL, &attr),
        Err(errno) => reply.error(errno),
    }
}

pub(crate) fn data(data: Result<Vec<u8>, Errno>, reply: ReplyData) {
    match data {
        Ok(data) => reply.data(&data),
        Err(errno) => reply.error(errno),
    }
}
