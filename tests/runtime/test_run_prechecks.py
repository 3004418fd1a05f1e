"""`aner run` on scripts whose early checks must leave things to the run: a model file the script
exports and then loads runs, and a write target that only the run can see is taken fails at its
call before the call does anything (no training is lost)."""

from __future__ import annotations

import re
import shutil

from aner_lang.cli import main


def test_a_script_loads_the_model_file_it_exported(tmp_path, tiny_gguf, capsys):
    shutil.copy(tiny_gguf, tmp_path / "base.gguf")
    script = tmp_path / "script.aner"
    script.write_text(
        'let m = load_model("base.gguf")\n'
        'export_gguf(m, "out/model.q8.gguf", dtype: q8_0, overwrite: true)\n'
        'let back = load_model("out/model.q8.gguf")\n'
        "print(model_info(back).layers)\n"
    )
    assert main(["run", str(script)]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out == "2\n"


def test_a_train_call_whose_checkpoint_folder_is_a_file_fails_before_training(
    tmp_path, tiny_gguf, capsys
):
    shutil.copy(tiny_gguf, tmp_path / "base.gguf")
    (tmp_path / "ck").write_text("mine\n")
    script = tmp_path / "script.aner"
    script.write_text(
        'let m = load_model("base.gguf")\n'
        "fn go(folder: String) {\n"
        '  let run = train(lora(m), texts(["a b c d"], context: 8), steps: 1, checkpoints: folder,\n'
        '                  log: "events.jsonl")\n'
        "  print(run.updates)\n"
        "}\n"
        'go("ck")\n'
    )
    assert main(["run", str(script)]) == 1
    err = capsys.readouterr().err
    assert re.search(
        r"script\.aner:3:13: error\[E-FILE-KIND\]: .*/ck: is a file, not the folder", err
    )
    assert (tmp_path / "ck").read_text() == "mine\n"
    assert not (tmp_path / "events.jsonl").exists()  # train never started
