// One decode step of the converted model (decodebench/building/convert.py):
// inputs input_ids [1, 1] int32, position [1] int32, causal_mask [1, 1, 1, context] fp16;
// output logits [1, 1, vocab]. The KV cache is either
// - kv=state: the model's MLState (key_cache_i/value_cache_i states, written in the graph;
//   mask slots 0...position visible), or
// - kv=input: arrays this engine holds and passes as inputs key_cache_i/value_cache_i
//   [1, Hkv, context, head_dim] fp16; the step returns the new token's key_i/value_i
//   [1, Hkv, 1, head_dim] and the engine writes them at `position` (as decodebench/modeling/
//   host.py's HostCache does); mask slots 0..<position visible, the new token is attended
//   inside the graph.
import CoreML
import Foundation

/// Where compiled models live: one per run, removed when the run ends, and everything left by a
/// run that was killed is removed when the next one starts (a compiled model is a full copy of
/// the weights; left alone they would fill the phone).
public enum CompiledModels {
    public static var directory: URL {
        FileManager.default.temporaryDirectory.appendingPathComponent("decodebench-compiled", isDirectory: true)
    }

    public static func removeAll() {
        try? FileManager.default.removeItem(at: directory)
    }

    /// Compile `package` (the cold part of loading) into this run's place.
    public static func compile(_ package: URL, name: String) async throws -> URL {
        let compiled = try await MLModel.compileModel(at: package)
        let kept = directory.appendingPathComponent("\(name).mlmodelc", isDirectory: true)
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        try? FileManager.default.removeItem(at: kept)
        try FileManager.default.moveItem(at: compiled, to: kept)
        return kept
    }
}

@available(iOS 18.0, macOS 15.0, *)
public struct CoreMLEngine: StepEngine {
    public let model: MLModel
    public let kv: KVCache
    private var state: MLState?
    private let context: Int
    private let inputIds: MLMultiArray
    private let position: MLMultiArray
    private let mask: MLMultiArray
    /// kv=input: (cache input name, new K/V output name, the cache array), keys and values by layer.
    private let caches: [(input: String, output: String, array: MLMultiArray)]

    /// Compile the pushed .mlpackage on the device and load it (cold), then load the compiled
    /// model again (warm); the second load is the one used.
    public static func load(compiled: URL, compileNs: UInt64, context: Int, kv: KVCache?) async throws -> (CoreMLEngine, LoadTimes) {
        let configuration = MLModelConfiguration()
        configuration.computeUnits = .cpuAndNeuralEngine
        let coldStart = MonotonicClock.now()
        _ = try await MLModel.load(contentsOf: compiled, configuration: configuration)
        let coldNs = compileNs + (MonotonicClock.now() - coldStart)
        let warmStart = MonotonicClock.now()
        let model = try await MLModel.load(contentsOf: compiled, configuration: configuration)
        let warmNs = MonotonicClock.now() - warmStart
        let engine = try CoreMLEngine(model: model, context: context, kv: kv)
        return (engine, LoadTimes(coldMs: Double(coldNs) / 1e6, warmMs: Double(warmNs) / 1e6))
    }

    public init(model: MLModel, context: Int, kv expected: KVCache?) throws {
        let description = model.modelDescription
        let found: KVCache = description.stateDescriptionsByName.isEmpty ? .input : .state
        if let expected = expected, expected != found {
            throw HarnessError.badJob("the job says kv=\(expected.rawValue) but the model keeps its cache as \(found.rawValue)")
        }
        self.model = model
        self.kv = found
        self.context = context
        self.inputIds = try MLMultiArray(shape: [1, 1], dataType: .int32)
        self.position = try MLMultiArray(shape: [1], dataType: .int32)
        self.mask = try MLMultiArray(shape: [1, 1, 1, NSNumber(value: context)], dataType: .float16)
        var caches: [(input: String, output: String, array: MLMultiArray)] = []
        if found == .input {
            let inputs = description.inputDescriptionsByName
            var layer = 0
            while inputs["key_cache_\(layer)"] != nil {
                for (input, output) in [("key_cache_\(layer)", "key_\(layer)"), ("value_cache_\(layer)", "value_\(layer)")] {
                    guard let shape = inputs[input]?.multiArrayConstraint?.shape, shape.count == 4,
                          shape[2].intValue == context else {
                        throw HarnessError.model("input \(input) is not a [1, Hkv, \(context), head_dim] cache")
                    }
                    guard description.outputDescriptionsByName[output] != nil else {
                        throw HarnessError.model("the model has no output \(output) for cache \(input)")
                    }
                    let array = try MLMultiArray(shape: shape, dataType: .float16)
                    caches.append((input: input, output: output, array: array))
                }
                layer += 1
            }
            if caches.isEmpty { throw HarnessError.model("a model without states has no key_cache_0 input") }
        }
        self.caches = caches
        self.state = found == .state ? model.makeState() : nil
        clear()
    }

    /// A fresh KV cache: a new MLState, or zeroed cache arrays; every slot masked.
    private func clear() {
        mask.withUnsafeMutableBufferPointer(ofType: Float16.self) { values, _ in
            values.update(repeating: -.infinity)
        }
        for cache in caches {
            cache.array.withUnsafeMutableBufferPointer(ofType: Float16.self) { values, _ in
                values.update(repeating: 0)
            }
        }
    }

    public mutating func reset() throws {
        if kv == .state { state = model.makeState() }
        clear()
    }

    public mutating func step(token: Int, position at: Int) throws -> Int {
        guard (0..<context).contains(at) else { throw HarnessError.model("position \(at) is outside the context of \(context)") }
        inputIds[0] = NSNumber(value: Int32(token))
        position[0] = NSNumber(value: Int32(at))
        if kv == .state { setVisible(at) }  // keys 0 ... at are visible
        var features: [String: MLFeatureValue] = [
            "input_ids": MLFeatureValue(multiArray: inputIds),
            "position": MLFeatureValue(multiArray: position),
            "causal_mask": MLFeatureValue(multiArray: mask),
        ]
        for cache in caches { features[cache.input] = MLFeatureValue(multiArray: cache.array) }
        let inputs = try MLDictionaryFeatureProvider(dictionary: features)
        let output: MLFeatureProvider
        if let state = state {
            output = try model.prediction(from: inputs, using: state)
        } else {
            output = try model.prediction(from: inputs)
        }
        guard let logits = output.featureValue(for: "logits")?.multiArrayValue else {
            throw HarnessError.model("the model has no output logits")
        }
        for cache in caches {
            guard let new = output.featureValue(for: cache.output)?.multiArrayValue else {
                throw HarnessError.model("the model has no output \(cache.output)")
            }
            try KVWriter.write(new, into: cache.array, at: at, name: cache.output)
        }
        if kv == .input { setVisible(at) }  // the next step sees this token in the cache
        return try Argmax.of(logits, position: at)
    }

    private func setVisible(_ slot: Int) {
        mask.withUnsafeMutableBufferPointer(ofType: Float16.self) { values, strides in
            values[slot * strides[3]] = 0
        }
    }
}

/// Greedy choice over the last axis of fp16 or fp32 logits; anything else, or a non-finite
/// logit, is an error naming the step (never a silent index 0).
public enum Argmax {
    public static func of(_ logits: MLMultiArray, position: Int) throws -> Int {
        let vocab = logits.shape.last!.intValue
        let stride = logits.strides.last!.intValue
        switch logits.dataType {
        case .float16:
            return try logits.withUnsafeBufferPointer(ofType: Float16.self) { values in
                try best(count: vocab, position: position) { Float(values[$0 * stride]) }
            }
        case .float32:
            return try logits.withUnsafeBufferPointer(ofType: Float.self) { values in
                try best(count: vocab, position: position) { values[$0 * stride] }
            }
        default:
            throw HarnessError.model("logits have data type \(logits.dataType.rawValue), expected float16 or float32")
        }
    }

    static func best(count: Int, position: Int, value: (Int) -> Float) throws -> Int {
        try GreedyScan(count: count, value: value).checked(position: position)
    }
}

/// kv=input: copy the step's new K or V [1, Hkv, 1, head_dim] into the cache [1, Hkv, context,
/// head_dim] at `position`, honouring both arrays' strides.
public enum KVWriter {
    public static func write(_ new: MLMultiArray, into cache: MLMultiArray, at position: Int, name: String) throws {
        let heads = cache.shape[1].intValue
        let depth = cache.shape[3].intValue
        guard new.shape.count == 4, new.shape[1].intValue == heads, new.shape[2].intValue == 1,
              new.shape[3].intValue == depth else {
            throw HarnessError.model("output \(name) has shape \(new.shape), expected [1, \(heads), 1, \(depth)]")
        }
        let from = new.strides.map { $0.intValue }
        try cache.withUnsafeMutableBufferPointer(ofType: Float16.self) { target, to in
            switch new.dataType {
            case .float16:
                new.withUnsafeBufferPointer(ofType: Float16.self) { values in
                    for head in 0..<heads {
                        for index in 0..<depth {
                            target[head * to[1] + position * to[2] + index * to[3]] = values[head * from[1] + index * from[3]]
                        }
                    }
                }
            case .float32:
                new.withUnsafeBufferPointer(ofType: Float.self) { values in
                    for head in 0..<heads {
                        for index in 0..<depth {
                            target[head * to[1] + position * to[2] + index * to[3]] = Float16(values[head * from[1] + index * from[3]])
                        }
                    }
                }
            default:
                throw HarnessError.model("output \(name) has data type \(new.dataType.rawValue), expected float16 or float32")
            }
        }
    }
}
