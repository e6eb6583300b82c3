// edgekit smoke test for an iOS bundle, run on the device by XCTest.
//
// Add to an iOS app's unit-test target (README.md, "On an iPhone or iPad"):
//   model.mlpackage  (Xcode compiles it to model.mlmodelc inside the test bundle)
//   golden.npz, manifest.json, EdgekitModelTests.swift
// It loads the model, feeds every golden input (a carried state's golden chunks in order, each
// taking the state the model gave for the one before it), checks every output against the float
// reference within the manifest's tolerance (top-1 agreement for classifiers, SNR for regression
// outputs where the tolerance sets one; max error relative to the output range, which decides where
// no such metric does or max_error_decides is set, and is printed as a warning where that metric
// passes), then measures latency (p50/p90/p99) against the board budget.
// Needs iOS 16+ / Xcode 15+. No third-party packages: golden.npz is read by the small
// reader below (numpy writes .npz as a stored, uncompressed zip of .npy files).

import CoreML
import Foundation
import XCTest

final class EdgekitModelTests: XCTestCase {
    private var testBundle: Bundle { Bundle(for: type(of: self)) }

    private func resource(_ name: String, _ ext: String) throws -> URL {
        guard let url = testBundle.url(forResource: name, withExtension: ext) else {
            throw XCTSkip("\(name).\(ext) is not in the test target: add it (README.md)")
        }
        return url
    }

    private func loadManifest() throws -> [String: Any] {
        let data = try Data(contentsOf: try resource("manifest", "json"))
        guard let obj = try JSONSerialization.jsonObject(with: data) as? [String: Any] else {
            throw NSError(domain: "edgekit", code: 2, userInfo: [NSLocalizedDescriptionKey: "manifest.json is not an object"])
        }
        return obj
    }

    private func loadModel(units: MLComputeUnits = .all) throws -> MLModel {
        let config = MLModelConfiguration()
        config.computeUnits = units
        return try MLModel(contentsOf: try resource("model", "mlmodelc"), configuration: config)
    }

    private func sample(_ arr: NpyArray, _ index: Int, shape: [Int]) throws -> MLMultiArray {
        let count = shape.reduce(1, *)
        let m = try MLMultiArray(shape: shape.map { NSNumber(value: $0) }, dataType: .float32)
        let ptr = m.dataPointer.bindMemory(to: Float32.self, capacity: count)
        for j in 0..<count { ptr[j] = arr.values[index * count + j] }
        return m
    }

    private static func floats(_ m: MLMultiArray) -> [Double] {
        (0..<m.count).map { m[$0].doubleValue }  // works for float16 and float32 outputs
    }

    func testGoldenOutputsWithinTolerance() throws {
        let manifest = try loadManifest()
        let golden = try Npz(url: try resource("golden", "npz"))
        let model = try loadModel()
        let g = manifest["golden"] as! [String: Any]
        let inputs = g["inputs"] as! [[String: Any]]
        let outputs = g["outputs"] as! [[String: Any]]
        let samples = g["samples"] as! Int
        let tol = manifest["tolerance"] as! [String: Any]
        let maxRel = (tol["max_rel_error"] as! NSNumber).doubleValue
        let minAgree = (tol["min_top1_agreement"] as! NSNumber).doubleValue
        let minSnr = (tol["min_snr_db"] as? NSNumber)?.doubleValue
        // as the host's check_output: max error decides only where no task metric does (or the tolerance says so)
        let maxErrorDecides = (tol["max_error_decides"] as? Bool) ?? false

        // a carried state (manifest "carry", --carry OUT=IN): the golden chunks are one sequence, run in order; the
        // first takes the golden (zero) state, every later one the state output this model gave for the chunk
        // before it, as in use (firmware/common/edgekit_smoke.run_carried does the same)
        let pairs = ((manifest["carry"] as? [String: Any])?["pairs"] as? [[String: String]]) ?? []
        var carried: [String: MLMultiArray] = [:]  // input name -> the state it takes on the next chunk
        var got: [[Double]] = Array(repeating: [], count: outputs.count)
        for i in 0..<samples {
            var feed: [String: MLFeatureValue] = [:]
            for spec in inputs {
                let shape = spec["shape"] as! [Int]
                let name = spec["name"] as! String
                let value = try carried[name] ?? sample(try golden.array(spec["key"] as! String), i, shape: shape)
                feed[(spec["runtime_name"] as? String ?? name)] = MLFeatureValue(multiArray: value)
            }
            let out = try model.prediction(from: try MLDictionaryFeatureProvider(dictionary: feed))
            for (k, spec) in outputs.enumerated() {
                let value = try XCTUnwrap(out.featureValue(for: (spec["runtime_name"] as? String ?? spec["name"] as! String))?.multiArrayValue,
                                          "model has no output \(spec["name"]!)")
                got[k] += Self.floats(value)
            }
            for pair in pairs {
                let o = try XCTUnwrap(outputs.first(where: { ($0["name"] as? String) == pair["output"] }), "no output \(pair["output"]!)")
                let s = try XCTUnwrap(inputs.first(where: { ($0["name"] as? String) == pair["input"] }), "no input \(pair["input"]!)")
                let value = try XCTUnwrap(out.featureValue(for: (o["runtime_name"] as? String ?? o["name"] as! String))?.multiArrayValue)
                let shape = s["shape"] as! [Int]
                let m = try MLMultiArray(shape: shape.map { NSNumber(value: $0) }, dataType: .float32)
                let ptr = m.dataPointer.bindMemory(to: Float32.self, capacity: m.count)
                let vals = Self.floats(value)  // float16 or float32 on the device: fed back as float32
                for j in 0..<m.count { ptr[j] = Float32(vals[j]) }
                carried[pair["input"]!] = m
            }
        }
        for (k, spec) in outputs.enumerated() {
            let ref = try golden.array(spec["key"] as! String)
            let r = ref.values.map { Double($0) }
            XCTAssertEqual(got[k].count, r.count, "output \(spec["name"]!) size")
            let err = zip(got[k], r).map { abs($0 - $1) }.max() ?? 0
            let scale = r.map { abs($0) }.max() ?? 0
            let rel = scale > 0 ? err / scale : err
            let absFloor = (tol["abs_floor"] as? NSNumber)?.doubleValue ?? 0
            let over = err > max(maxRel * scale, absFloor)
            let kind = spec["kind"] as? String  // recorded at conversion (older bundles: none)
            var taskPasses: Bool? = nil  // the output's task metric (top-1 agreement, SNR) where the tolerance sets one
            if ref.shape.count == 2 && ref.shape[1] > 1 {  // classifier: top-1 agreement
                let classes = ref.shape[1]
                var agree = 0
                for i in 0..<ref.shape[0] {
                    let a = Array(got[k][(i * classes)..<((i + 1) * classes)])
                    let b = Array(r[(i * classes)..<((i + 1) * classes)])
                    // a flipped near-tie (float's top-2 margin under 1% of the range) counts as agreeing, as the
                    // host's check_output (firmware/common/edgekit_smoke.py) counts it
                    let top2 = b.sorted(by: >)
                    let nearTie = top2[0] - top2[1] < 0.01 * scale
                    if a.firstIndex(of: a.max()!) == b.firstIndex(of: b.max()!) || nearTie { agree += 1 }
                }
                let share = Double(agree) / Double(ref.shape[0])
                XCTAssertGreaterThanOrEqual(share, minAgree, "output \(spec["name"]!): top-1 agreement \(share)")
                taskPasses = share >= minAgree
            } else if kind == nil || kind == "regression", let bar = minSnr {  // regression: SNR against float
                let noise = zip(got[k], r).map { ($0 - $1) * ($0 - $1) }.reduce(0, +)
                let signal = r.map { $0 * $0 }.reduce(0, +)
                let snr = noise == 0 ? Double.infinity : 10 * log10(signal / noise)
                XCTAssertGreaterThanOrEqual(snr, bar, "output \(spec["name"]!): SNR \(snr) dB")
                taskPasses = snr >= bar
            }
            if over && taskPasses == true && !maxErrorDecides {  // the worst sample is reported, not deciding
                print("warning: output \(spec["name"]!): max error \(err) is \(rel * 100)% of range; its task metric passes")
            } else {
                XCTAssertFalse(over, "output \(spec["name"]!): max error \(err) is \(rel * 100)% of range")
            }
        }
    }

    func testLatencyWithinBudget() throws {
        let manifest = try loadManifest()
        let golden = try Npz(url: try resource("golden", "npz"))
        let model = try loadModel()
        let g = manifest["golden"] as! [String: Any]
        var feed: [String: MLFeatureValue] = [:]
        for spec in g["inputs"] as! [[String: Any]] {
            let arr = try golden.array(spec["key"] as! String)
            feed[(spec["runtime_name"] as? String ?? spec["name"] as! String)] = MLFeatureValue(multiArray: try sample(arr, 0, shape: spec["shape"] as! [Int]))
        }
        let provider = try MLDictionaryFeatureProvider(dictionary: feed)
        for _ in 0..<10 { _ = try model.prediction(from: provider) }  // warm-up (ANE load, caches)
        var ms: [Double] = []
        for _ in 0..<100 {
            let t0 = DispatchTime.now().uptimeNanoseconds
            _ = try model.prediction(from: provider)
            ms.append(Double(DispatchTime.now().uptimeNanoseconds - t0) / 1e6)
        }
        ms.sort()
        let p = { (q: Double) in ms[min(ms.count - 1, Int(q * Double(ms.count)))] }
        print("[edgekit-smoke] latency p50 \(p(0.5)) / p90 \(p(0.9)) / p99 \(p(0.99)) ms")
        if let budgets = manifest["budgets"] as? [String: Any], let budget = budgets["latency_ms"] as? NSNumber {
            XCTAssertLessThanOrEqual(p(0.9), budget.doubleValue, "p90 latency over the board budget")
        }
    }
}

// MARK: - a minimal .npz / .npy reader (float32 / float16 / float64 / int64, little-endian, C order)

struct NpyArray {
    let shape: [Int]
    let values: [Float32]
}

struct Npz {
    private var arrays: [String: NpyArray] = [:]

    init(url: URL) throws {
        let data = try Data(contentsOf: url)
        let bytes = [UInt8](data)
        var i = 0
        // walk the zip's local file headers (PK\u{3}\u{4}); numpy stores entries uncompressed
        while i + 30 <= bytes.count, bytes[i] == 0x50, bytes[i + 1] == 0x4B, bytes[i + 2] == 0x03, bytes[i + 3] == 0x04 {
            let method = Int(bytes[i + 8]) | Int(bytes[i + 9]) << 8
            let nameLen = Int(bytes[i + 26]) | Int(bytes[i + 27]) << 8
            let extraLen = Int(bytes[i + 28]) | Int(bytes[i + 29]) << 8
            let name = String(decoding: bytes[(i + 30)..<(i + 30 + nameLen)], as: UTF8.self)
            let start = i + 30 + nameLen + extraLen
            guard method == 0 else {
                throw NSError(domain: "edgekit", code: 2, userInfo: [NSLocalizedDescriptionKey:
                    "\(name) is compressed in golden.npz; re-save it with numpy.savez (not savez_compressed)"])
            }
            let (arr, length) = try Npz.parseNpy(bytes, start)
            arrays[name.replacingOccurrences(of: ".npy", with: "")] = arr
            i = start + length
            // skip an optional data descriptor (PK\u{7}\u{8})
            if i + 4 <= bytes.count, bytes[i] == 0x50, bytes[i + 1] == 0x4B, bytes[i + 2] == 0x07, bytes[i + 3] == 0x08 {
                i += 16
                if i + 4 <= bytes.count, !(bytes[i] == 0x50 && bytes[i + 1] == 0x4B) { i += 8 }  // zip64 descriptor
            }
        }
    }

    func array(_ key: String) throws -> NpyArray {
        guard let a = arrays[key] else {
            throw NSError(domain: "edgekit", code: 2, userInfo: [NSLocalizedDescriptionKey: "golden.npz has no \(key)"])
        }
        return a
    }

    static func parseNpy(_ b: [UInt8], _ s: Int) throws -> (NpyArray, Int) {
        guard b.count > s + 10, b[s] == 0x93, String(decoding: b[(s + 1)..<(s + 6)], as: UTF8.self) == "NUMPY" else {
            throw NSError(domain: "edgekit", code: 2, userInfo: [NSLocalizedDescriptionKey: "not a .npy entry"])
        }
        let major = Int(b[s + 6])
        let headerLen: Int
        let headerStart: Int
        if major == 1 {
            headerLen = Int(b[s + 8]) | Int(b[s + 9]) << 8
            headerStart = s + 10
        } else {
            headerLen = Int(b[s + 8]) | Int(b[s + 9]) << 8 | Int(b[s + 10]) << 16 | Int(b[s + 11]) << 24
            headerStart = s + 12
        }
        let header = String(decoding: b[headerStart..<(headerStart + headerLen)], as: UTF8.self)
        func field(_ key: String) -> String {
            guard let r = header.range(of: "'\(key)': ") else { return "" }
            let rest = header[r.upperBound...]
            if rest.hasPrefix("(") { return String(rest[rest.startIndex...rest.firstIndex(of: ")")!]) }
            return String(rest.prefix { $0 != "," && $0 != "}" })
        }
        let descr = field("descr").trimmingCharacters(in: CharacterSet(charactersIn: "' "))
        let shape = field("shape").trimmingCharacters(in: CharacterSet(charactersIn: "() "))
            .split(separator: ",").compactMap { Int($0.trimmingCharacters(in: .whitespaces)) }
        let count = shape.reduce(1, *)
        let dataStart = headerStart + headerLen
        var values = [Float32](repeating: 0, count: count)
        let item: Int
        switch descr {
        case "<f4":
            item = 4
            for k in 0..<count {
                let o = dataStart + 4 * k
                values[k] = Float32(bitPattern: UInt32(b[o]) | UInt32(b[o + 1]) << 8 | UInt32(b[o + 2]) << 16 | UInt32(b[o + 3]) << 24)
            }
        case "<f8":
            item = 8
            for k in 0..<count {
                var u: UInt64 = 0
                for j in 0..<8 { u |= UInt64(b[dataStart + 8 * k + j]) << (8 * UInt64(j)) }
                values[k] = Float32(Double(bitPattern: u))
            }
        case "<f2":
            item = 2
            for k in 0..<count {
                let o = dataStart + 2 * k
                values[k] = Float32(Float16(bitPattern: UInt16(b[o]) | UInt16(b[o + 1]) << 8))
            }
        case "<i8":
            item = 8
            for k in 0..<count {
                var u: UInt64 = 0
                for j in 0..<8 { u |= UInt64(b[dataStart + 8 * k + j]) << (8 * UInt64(j)) }
                values[k] = Float32(Int64(bitPattern: u))
            }
        default:
            throw NSError(domain: "edgekit", code: 2, userInfo: [NSLocalizedDescriptionKey: "unsupported .npy dtype \(descr)"])
        }
        return (NpyArray(shape: shape, values: values), headerLen + (headerStart - s) + item * count)
    }
}
