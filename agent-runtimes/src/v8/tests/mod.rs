//! The V8 reader over real builds' constants (`agent_fixtures::v8`) and a
//! small ELF file made here.

mod cost;
mod elf;
mod frames;
mod inlined;
mod layout;
mod lines;
mod strings;
