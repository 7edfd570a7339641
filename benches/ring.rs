//! Encode + append + read-back of one entry through a ring in a shared
//! (anonymous, MAP_SHARED) region, for 64 B, 1 KiB and 16 KiB payloads.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lockstep_common::entry::{footprint, EntryHeader, Kind};
use lockstep_common::region::{Region, RegionSpec};
use lockstep_common::ring::{ReadOutcome, RingReader, RingWriter};

fn ring(c: &mut Criterion) {
    let spec = RegionSpec {
        cluster: "bench".into(),
        node: 1,
        ring_size: 1 << 24,
    };
    let region = Region::anonymous(&spec).expect("anonymous region");
    let mut group = c.benchmark_group("ring_append_read");
    for size in [64usize, 1024, 16 * 1024] {
        let payload = vec![0x5au8; size];
        let mut scratch = vec![0u8; footprint(size)];
        let mut buf = Vec::with_capacity(footprint(size));
        let mut w = RingWriter::new(spec.ring_size, 0);
        let mut r = RingReader::new(spec.ring_size, 0, 1, 1 << 20);
        let mut seq = 1u64;
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, _| {
            b.iter(|| {
                let hdr = EntryHeader::new(Kind::Data, 1, seq, 1, size as u32);
                // The reader keeps up, so everything before us is "acked".
                let a = w
                    .append(region.ring(), &hdr, &payload, r.pos(), &mut scratch)
                    .expect("append");
                match r.poll(region.ring(), a.end, &mut buf) {
                    ReadOutcome::Entry { header, .. } => assert_eq!(header.seq, seq),
                    other => panic!("{other:?}"),
                }
                seq += 1;
            })
        });
    }
    group.finish();
}

criterion_group!(benches, ring);
criterion_main!(benches);
